(function(){
  var q=document.getElementById('q'), st=document.getElementById('status');
  function apply(){
    var text=q.value.toLowerCase(), want=st.value, shown=0;
    var rows=document.querySelectorAll('table.matrix tbody tr');
    for(var i=0;i<rows.length;i++){
      var r=rows[i], ok=(!want||r.getAttribute('data-status')===want)&&
        (!text||r.textContent.toLowerCase().indexOf(text)>=0);
      r.hidden=!ok; if(ok){shown++;}
    }
    document.getElementById('shown').textContent=String(shown);
    var sections=document.querySelectorAll('section.adapter');
    for(var j=0;j<sections.length;j++){sections[j].hidden=!sections[j].querySelector('tbody tr:not([hidden])');}
  }
  q.addEventListener('input',apply); st.addEventListener('change',apply);
  var params=new URLSearchParams(window.location.search);
  if(params.get('status')){st.value=params.get('status');}
  if(params.get('q')){q.value=params.get('q');}
  apply();
})();
